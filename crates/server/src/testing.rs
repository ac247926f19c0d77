//! What the crate's unit tests share.

/// The size of what `f` returns, found without calling it. A future's size
/// is its largest state, and a task keeps that room for its whole life: the
/// tests of what every idle stream carries measure with this.
pub(crate) fn returned_size<A, T>(_: &impl FnOnce(A) -> T) -> usize {
    std::mem::size_of::<T>()
}
