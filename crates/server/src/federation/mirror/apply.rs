//! A mirror's applier: consumes the notifications in its inbox from a
//! durable cursor and settles each path with compare-and-set (the rules in
//! the module's documentation), discovers and reconciles what the peer
//! holds, and keeps the mark of the peer's log it has taken.

use super::*;

/// One mirror's applier state.
pub(super) struct Applier<'a> {
    pub(super) mirror: &'a Mirrors,
    pub(super) spec: &'a Spec,
    pub(super) glob: Glob,
    pub(super) inbox: String,
    /// Paths seen in notifications or held locally: what reconciliation
    /// re-reads.
    pub(super) known: BTreeSet<String>,
    /// The hash this mirror last wrote at a path (a cache of "who wrote
    /// what is here").
    pub(super) mine: HashMap<String, Option<String>>,
    /// Paths notified since the last reconciliation: their stream is
    /// flowing, so reconciliation leaves them alone (re-reading a path
    /// mid-burst would jump ahead of its notifications).
    pub(super) touched: std::collections::HashSet<String>,
    /// The server the subscription is held at: only its deliveries are
    /// applied. (Re-reads and discovery always go to the peer itself: a
    /// relay's answers are not signed.)
    pub(super) upstream: String,
    /// The sequence of the peer's change this mirror last took at a path
    /// (a cache of what the log says): older signed changes are refused.
    pub(super) sequences: HashMap<String, u64>,
    /// A signed change at or below this, for a path whose sequence is not
    /// known here (not cached, and not kept with the local change that
    /// wrote it: a deletion, a re-read), may be older than what the path
    /// holds: it is settled by reading the path at the peer, not applied.
    /// The stored mark at start (a restart forgets the cache), raised to
    /// [`Self::taken`] whenever the cache is dropped.
    pub(super) unknown_below: u64,
    /// The highest sequence of the peer's this mirror took.
    pub(super) taken: u64,
    /// The stored mark: every sequence taken, in this run or an earlier
    /// one, is at or below it (raised before a write takes one).
    pub(super) marked: u64,
    /// Paths a reconciliation found behind the peer while a relay held
    /// the subscription: a relay that has still not notified them at the
    /// next reconciliation withheld them.
    pub(super) suspects: std::collections::HashSet<String>,
    /// Set when the relay held at forged a change (`"forged"`) or withheld
    /// one (`"withheld"`): the mirror leaves it.
    pub(super) distrusted: Option<(String, &'static str)>,
    /// Set by a notice that the upstream lost history: every known path
    /// is read again at the peer before the next notification.
    pub(super) resync: bool,
}

/// A notice in the inbox that its sender lost history.
#[derive(Deserialize)]
struct Told {
    event_type: String,
    #[serde(rename = "ref")]
    reference: Option<String>,
    #[serde(default)]
    agent: Option<Agent>,
    payload: ToldPayload,
}

#[derive(Deserialize)]
struct ToldPayload {
    data: ToldData,
}

#[derive(Deserialize)]
struct ToldData {
    fork: i64,
    base: i64,
}

/// The key of a mirror's mark of its peer's log: the mirror and the peer
/// (a mirror pointed at another peer starts with no mark: the old one
/// counts another log).
pub(super) fn mark_name(spec: &Spec) -> String {
    format!("{}@{}", spec.name, spec.peer)
}

/// Just the `ref` of a stored event.
#[derive(Deserialize)]
pub(super) struct Reference {
    #[serde(rename = "ref")]
    pub(super) reference: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Stored {
    #[serde(rename = "ref")]
    pub(super) reference: Option<String>,
    #[serde(default)]
    pub(super) agent: Option<Agent>,
    pub(super) payload: StoredPayload,
}

#[derive(Deserialize)]
pub(super) struct StoredPayload {
    pub(super) data: NotificationData,
    #[serde(default)]
    pub(super) chain_id: Option<String>,
    #[serde(default)]
    pub(super) included: Map<String, Value>,
}

impl Applier<'_> {
    /// The cursor: stored, else the head (nothing was delivered here for a
    /// mirror that never ran); also learns the paths held locally.
    pub(super) async fn start(&mut self) -> Result<EventId, StoreError> {
        let store = &self.mirror.store;
        let mark = store.peer_mark(CURSOR_OWNER, &mark_name(self.spec)).await?.unwrap_or(0).max(0) as u64;
        (self.marked, self.unknown_below) = (mark, mark);
        let prefix = literal_prefix(&self.spec.pattern);
        for entry in store.tree_entries_below(&prefix, MAX_KNOWN).await? {
            if self.glob.matches(&entry.path) {
                self.known.insert(entry.path);
            }
        }
        if let Some(cursor) = store.device_cursor(CURSOR_OWNER, &self.spec.name).await? {
            return Ok(cursor);
        }
        let head = store.head().await?;
        store.device_ack(CURSOR_OWNER, &self.spec.name, head, now_ms()).await
    }

    pub(super) fn agent(&self) -> Agent {
        Agent { id: self.mirror.server.hash().to_owned(), kind: Some(format!("mirror:{}", self.spec.name)) }
    }

    /// Applies the inbox's notifications after `cursor`; the new cursor.
    pub(super) async fn step(&mut self, mut cursor: EventId) -> Result<EventId, StoreError> {
        loop {
            let (records, reached) = self.mirror.store.engine_changes(cursor, INBOX_TYPES, BATCH).await?;
            for record in &records {
                let Ok(stored) = serde_json::from_str::<Stored>(&record.body) else {
                    if let Ok(told) = serde_json::from_str::<Told>(&record.body) {
                        self.told(told);
                    }
                    continue;
                };
                if stored.reference.as_deref() != Some(self.inbox.as_str()) {
                    continue;
                }
                // Only the mirrored peer's deliveries are applied (the
                // receiver set the agent from the verified signature).
                if stored.agent.as_ref().is_none_or(|a| a.id != self.upstream) {
                    self.count("foreign_ignored");
                    continue;
                }
                self.apply(stored.payload).await?;
            }
            if reached != cursor {
                cursor = self.mirror.store.device_ack(CURSOR_OWNER, &self.spec.name, reached, now_ms()).await?;
            }
            if records.len() < BATCH {
                return Ok(cursor);
            }
        }
    }

    /// A notice in the inbox that its sender lost history: from the
    /// upstream, every known path is read again at the peer (what the
    /// mirror took from the lost history is set back to what the peer
    /// holds, a path only the lost history created is deleted).
    fn told(&mut self, told: Told) {
        let from_upstream = told.agent.as_ref().is_some_and(|a| a.id == self.upstream);
        if told.event_type != names::SUBSCRIPTION_HISTORY_LOST || told.reference.as_deref() != Some(self.inbox.as_str()) || !from_upstream {
            return;
        }
        let ToldData { fork, base } = told.payload.data;
        tracing::warn!(
            mirror = self.spec.name,
            upstream = self.upstream,
            fork,
            base,
            "the upstream lost history it had notified; reading every path again"
        );
        self.resync = true;
        self.count("history_lost");
    }

    pub(super) async fn apply(&mut self, n: StoredPayload) -> Result<(), StoreError> {
        let path = n.data.uri.clone();
        if !self.glob.matches(&path) || tidings_protocol::tree::is_system(&path) || validate_path(&path).is_err() {
            return Ok(());
        }
        let outcome = self.decide(&path, n).await?;
        self.count(outcome);
        Ok(())
    }

    /// Applies one notification for `path`; what became of it.
    ///
    /// Only a change the peer signed counts as the upstream notifying the
    /// path (it is then known, left alone by the next reconciliation, and
    /// clears a suspicion of withholding); anything else is settled by
    /// reading the path at the peer, never by its word.
    pub(super) async fn decide(&mut self, path: &str, n: StoredPayload) -> Result<&'static str, StoreError> {
        let t = Transition { uri: &n.data.uri, hash: n.data.hash.as_deref(), previous_hash: n.data.previous_hash.as_deref() };
        let carried = signed::carried(n.data.signed.iter().map(String::as_str), &n.included);
        let proof = signed::prove(&carried, &self.spec.peer, t);
        if proof == Proof::Forged {
            // Never applied, never re-read on its word; a relay that
            // forges is left.
            if self.upstream != self.spec.peer {
                self.distrusted = Some((self.upstream.clone(), "forged"));
            }
            return Ok("forged_refused");
        }
        // What the change leaves at the path is its signed hash (none for a
        // deletion), whatever kind the notification names.
        let target = n.data.hash.clone();
        let local = self.mirror.store.tree_get(path).await?;
        let here = local.as_ref().map(|e| e.hash.clone());
        let chain_id = n.chain_id.clone().unwrap_or_else(generate_id);
        let mut proof = proof;
        if let Proof::Signed { sequence } = proof {
            match self.held_sequence(path, local.as_ref()).await? {
                // Older than what is held: an old lap, or a relay
                // replaying. Not a notification of the path: a
                // reconciliation still compares it with the peer.
                Some(held) if here != target && sequence <= held => return Ok("rollback_refused"),
                // Nothing here, and perhaps a deletion taken before a
                // restart (a deletion leaves nothing to read its sequence
                // from): the peer says what the path holds. With an entity
                // here, a replay would need the path to hold the old
                // content again (the A→B→A limit); a change that follows
                // what is held is taken, as before.
                None if local.is_none() && sequence <= self.unknown_below => proof = Proof::Unsigned,
                _ => {}
            }
        }
        if let Proof::Signed { sequence } = proof {
            if self.known.len() < MAX_KNOWN {
                self.known.insert(path.to_owned());
            }
            if self.touched.len() < MAX_KNOWN {
                self.touched.insert(path.to_owned());
            }
            // The relay notified this path: whatever a reconciliation found
            // it behind on is on its way.
            self.suspects.remove(path);
            if here == target {
                // Taken too (a deletion of what is absent here, say): a
                // replay of an older change is refused after a restart.
                self.mark(sequence).await?;
                self.held(path, sequence);
                return Ok("unchanged");
            }
            if here == n.data.previous_hash {
                let bundled = match &target {
                    None => Some(None),
                    Some(h) => n
                        .included
                        .get(h)
                        .and_then(|v| serde_json::from_value::<Entity>(v.clone()).ok())
                        .filter(|e| e.check().is_ok())
                        .map(|e| e.canonical())
                        .filter(|(_, bundled)| bundled == h)
                        .map(Some),
                };
                if let Some(bytes) = bundled {
                    self.mark(sequence).await?;
                    let kept = signed::verified(&carried, t);
                    let written = self.write(path, here.as_deref(), bytes, &chain_id, &kept).await?;
                    if written {
                        self.held(path, sequence);
                    }
                    return Ok(if written { "applied" } else { "stale_rejected" });
                }
                // No usable bundled entity: read it instead.
            }
        }
        if !self.faithful(path, local.as_ref()).await? {
            return Ok("stale_rejected");
        }
        let outcome = self.reread_and_apply(path, here, &chain_id).await?;
        // What the peer did not sign is taken from the peer itself.
        Ok(if proof == Proof::Unsigned && outcome == "gap_reread" { "unsigned_reread" } else { outcome })
    }

    /// Raises the stored mark before a write takes the peer's change
    /// `sequence`, so that after a restart no change at or below it is
    /// applied on its signature alone.
    pub(super) async fn mark(&mut self, sequence: u64) -> Result<(), StoreError> {
        if sequence > self.marked {
            let ahead = i64::try_from(sequence.saturating_add(MARK_AHEAD)).unwrap_or(i64::MAX);
            let marked = self.mirror.store.peer_mark_raise(CURSOR_OWNER, &mark_name(self.spec), ahead, now_ms()).await?;
            self.marked = marked.max(0) as u64;
        }
        Ok(())
    }

    /// Records that the peer's change `sequence` is what `path` holds.
    pub(super) fn held(&mut self, path: &str, sequence: u64) {
        self.taken = self.taken.max(sequence);
        if self.sequences.len() >= MAX_KNOWN {
            self.sequences.clear();
            self.unknown_below = self.unknown_below.max(self.taken);
        }
        let held = self.sequences.entry(path.to_owned()).or_default();
        *held = (*held).max(sequence);
    }

    /// The sequence of the peer's change that `path` holds here: cached,
    /// else read from the signed changes kept with the local change that
    /// wrote it; `None` when unknown.
    pub(super) async fn held_sequence(&mut self, path: &str, local: Option<&crate::store::TreeEntry>) -> Result<Option<u64>, StoreError> {
        if let Some(s) = self.sequences.get(path) {
            return Ok(Some(*s));
        }
        let Some(entry) = local else { return Ok(None) };
        let Some(record) = self.writer_of(entry).await? else { return Ok(None) };
        #[derive(Deserialize)]
        struct Body {
            payload: Carried,
        }
        #[derive(Deserialize)]
        struct Carried {
            #[serde(default)]
            signed: Vec<SignedChange>,
        }
        let sequence = serde_json::from_str::<Body>(&record.body).ok().and_then(|b| {
            b.payload.signed.iter().find(|s| s.origin() == Some(self.spec.peer.as_str()) && s.verifies()).and_then(SignedChange::sequence)
        });
        if let Some(sequence) = sequence {
            self.held(path, sequence);
        }
        Ok(sequence)
    }

    /// Re-reads `path` at the peer and writes its bytes over `here`.
    pub(super) async fn reread_and_apply(&mut self, path: &str, here: Option<String>, chain_id: &str) -> Result<&'static str, StoreError> {
        Ok(match self.mirror.reread(&self.spec.peer, path).await {
            Ok(read) if read.bytes.as_ref().map(|(_, h)| h) == here.as_ref() => {
                if let Some(sequence) = read.sequence {
                    self.held(path, sequence);
                }
                "stale_rejected"
            }
            Ok(read) => {
                self.mark(read.sequence.unwrap_or(0)).await?;
                match self.write(path, here.as_deref(), read.bytes, chain_id, &[]).await? {
                    true => {
                        if let Some(sequence) = read.sequence {
                            self.held(path, sequence);
                        }
                        "gap_reread"
                    }
                    false => "stale_rejected",
                }
            }
            Err(why) => {
                tracing::debug!(mirror = self.spec.name, why = %why, "re-read failed; reconciliation retries it");
                self.mirror.set_state(&self.spec.name, |s| s.last_error = Some(why.to_string()));
                "reread_failed"
            }
        })
    }

    /// Whether what is at `path` was put there by this mirror (or nothing
    /// is there): then a mismatch is a gap, not a stale lap.
    pub(super) async fn faithful(&mut self, path: &str, local: Option<&crate::store::TreeEntry>) -> Result<bool, StoreError> {
        let Some(entry) = local else { return Ok(true) };
        if let Some(written) = self.mine.get(path) {
            return Ok(written.as_deref() == Some(entry.hash.as_str()));
        }
        // Not written since this mirror started: ask the log who did.
        let Some(record) = self.writer_of(entry).await? else {
            // Pruned: who wrote it is unknown, so it is not overwritten.
            return Ok(false);
        };
        let agent = serde_json::from_str::<Value>(&record.body).ok().map(|b| b["agent"].clone()).unwrap_or(Value::Null);
        let ours = serde_json::to_value(self.agent()).unwrap_or_default();
        Ok(agent == ours)
    }

    /// The change event that put `entry` there, unless retention pruned it.
    pub(super) async fn writer_of(&self, entry: &crate::store::TreeEntry) -> Result<Option<crate::store::Record>, StoreError> {
        let records = self.mirror.store.read_after(entry.changed_event - 1, 1).await?;
        Ok(records.into_iter().next().filter(|r| r.id == entry.changed_event))
    }

    /// A CAS write of `bytes` (or a deletion) over `here`; `false` if the
    /// path changed meanwhile.
    /// `carried`: the signed changes it was taken from, kept with the
    /// change so the engine forwards them.
    pub(super) async fn write(
        &mut self,
        path: &str,
        here: Option<&str>,
        bytes: Option<(String, String)>,
        chain_id: &str,
        carried: &[SignedChange],
    ) -> Result<bool, StoreError> {
        let condition = match here {
            Some(h) => Condition::IfMatch(h.to_owned()),
            None if bytes.is_none() => return Ok(true),
            None => Condition::IfAbsent,
        };
        let hash = bytes.as_ref().map(|(_, h)| h.clone());
        let write = TreeWrite {
            path: path.to_owned(),
            entity: bytes,
            condition,
            event: change_event_with(
                path,
                self.agent(),
                hash.clone(),
                chain_id.to_owned(),
                (!carried.is_empty()).then(|| serde_json::to_value(carried).unwrap_or_default()),
            ),
        };
        let done = matches!(self.mirror.store.tree_write(write).await?, TreeOutcome::Done { .. });
        if done {
            // A cache: dropped whole when it is full (the log answers then).
            if self.mine.len() >= MAX_KNOWN {
                self.mine.clear();
            }
            self.mine.insert(path.to_owned(), hash);
        }
        Ok(done)
    }

    /// Learns the paths the peer holds under the pattern (its tree listing,
    /// walked from the pattern's literal prefix, bounded).
    pub(super) async fn discover(&mut self, stop: &CancellationToken) {
        let Ok(endpoint) = self.mirror.endpoint(&self.spec.peer).await else { return };
        let mut dirs = vec![literal_prefix(&self.spec.pattern)];
        if self.glob.matches(&dirs[0]) {
            self.known.insert(dirs[0].clone());
        }
        // Bounded whatever the peer answers: each directory once, only
        // below the one listed, at most MAX_LISTINGS listings.
        let mut listed = std::collections::HashSet::new();
        while let Some(dir) = dirs.pop() {
            if self.known.len() >= MAX_KNOWN || listed.len() >= MAX_LISTINGS || stop.is_cancelled() {
                break;
            }
            if !listed.insert(dir.clone()) {
                continue;
            }
            let Ok(request) = self.mirror.http.get(&format!("{endpoint}/v1/tree/{dir}/")) else { return };
            let Ok(r) = request.send().await else { return };
            let listing = tidings_outbound::read_json(r).await;
            let below = format!("{dir}/");
            for child in listing["children"].as_array().into_iter().flatten() {
                let Some(path) = child["path"].as_str() else { continue };
                if !path.starts_with(&below) || tidings_protocol::tree::is_system(path) || validate_path(path).is_err() {
                    continue;
                }
                if child["entity"] == true && self.glob.matches(path) && self.known.len() < MAX_KNOWN {
                    self.known.insert(path.to_owned());
                }
                if child["has_children"] == true && path.split('/').count() < tidings_protocol::tree::MAX_DEPTH && dirs.len() < MAX_LISTINGS
                {
                    dirs.push(path.to_owned());
                }
            }
        }
    }

    /// Compares with the peer: re-reads there every known path that was
    /// not notified since the last time (after listing the peer's paths,
    /// while a relay holds the subscription), and applies what moved on.
    /// The last notification of a burst, if it was lost, is found here;
    /// so is a relay that withholds: a path it has still not notified one
    /// reconciliation after the peer was found ahead marks it distrusted.
    pub(super) async fn reconcile(&mut self, stop: &CancellationToken) {
        let relayed = self.upstream != self.spec.peer;
        if relayed && !self.suspects.is_empty() {
            tracing::warn!(mirror = self.spec.name, relay = self.upstream, paths = self.suspects.len(), "the relay withheld changes");
            self.distrusted = Some((self.upstream.clone(), "withheld"));
        }
        self.suspects.clear();
        if relayed {
            self.discover(stop).await;
        }
        self.compare(stop, relayed).await;
    }

    /// Re-reads every known path not notified since the last time; with
    /// `watch`, the paths found behind become suspects.
    pub(super) async fn compare(&mut self, stop: &CancellationToken, watch: bool) {
        let touched = std::mem::take(&mut self.touched);
        let paths: Vec<String> = self.known.iter().filter(|p| !touched.contains(*p)).cloned().collect();
        for path in paths {
            if stop.is_cancelled() {
                return;
            }
            let local = match self.mirror.store.tree_get(&path).await {
                Ok(l) => l,
                Err(_) => return,
            };
            match self.faithful(&path, local.as_ref()).await {
                Ok(true) => {}
                _ => continue,
            }
            let here = local.map(|e| e.hash);
            let Ok(read) = self.mirror.reread(&self.spec.peer, &path).await else { continue };
            if let Some(sequence) = read.sequence {
                self.held(&path, sequence);
            }
            if read.bytes.as_ref().map(|(_, h)| h) != here.as_ref()
                && self.mark(read.sequence.unwrap_or(0)).await.is_ok()
                && let Ok(true) = self.write(&path, here.as_deref(), read.bytes, &generate_id(), &[]).await
            {
                self.count("gap_reread");
                if watch && self.suspects.len() < MAX_KNOWN {
                    self.suspects.insert(path);
                }
            }
        }
    }

    /// Re-reads every known path at the peer (after attaching anew:
    /// whatever the old upstream did not deliver is found here).
    pub(super) async fn reread_all(&mut self, stop: &CancellationToken) {
        self.touched.clear();
        self.suspects.clear();
        self.compare(stop, false).await;
    }

    pub(super) fn count(&self, outcome: &'static str) {
        crate::metrics::mirror_applied(outcome);
        self.mirror.set_state(&self.spec.name, |s| *s.applies.entry(outcome).or_default() += 1);
    }
}

/// What a mirror reads in its inbox.
pub(super) const INBOX_TYPES: &[&str] = &[names::SUBSCRIPTION_NOTIFICATION, names::SUBSCRIPTION_HISTORY_LOST];

/// The segments of `pattern` before its first wildcard.
fn literal_prefix(pattern: &str) -> String {
    pattern.split('/').take_while(|s| !s.contains('*')).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_literal_prefix_stops_at_the_first_wildcard() {
        assert_eq!(literal_prefix("feeds/**"), "feeds");
        assert_eq!(literal_prefix("a/b/*/c"), "a/b");
        assert_eq!(literal_prefix("a/b"), "a/b");
    }
}
