//! How errors are written to the log: with their whole cause chain, so
//! that `LISTEN connection lost` says why (`LISTEN probe: db error: FATAL:
//! terminating connection due to administrator command`), not only what.

use std::fmt;

/// An error and its causes, displayed `what: why: root cause`. A cause
/// whose text its parent already shows (`#[error("...: {0}")]`) is not
/// repeated.
#[derive(Debug)]
pub struct Chain<'a>(&'a (dyn std::error::Error + 'static));

/// `e` with its causes, for a log field (`error = %chain(&e)`; an
/// `anyhow::Error` as `chain(e.as_ref())`).
pub fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Chain<'a> {
    Chain(e)
}

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_cause_once() {
        let e = Outer(Middle(std::io::Error::other("the root cause")));
        assert_eq!(chain(&e).to_string(), "outer: middle: the root cause");
        let any = anyhow::Error::new(std::io::Error::other("refused")).context("LISTEN probe");
        assert_eq!(chain(any.as_ref()).to_string(), "LISTEN probe: refused");
    }
}
