//! Event ids are gap-free and become visible in commit order: a reader that
//! has seen id N never later sees an id below N appear.

use std::sync::Arc;

use serde_json::json;

use crate::both_stores;
use crate::helpers::{Backend, spawn_app};

both_stores!(commit_order_under_concurrent_publishers);

async fn commit_order_under_concurrent_publishers(backend: Backend) {
    const PUBLISHERS: usize = 8;
    const EACH: usize = 1000;
    let app = Arc::new(spawn_app(backend).await);
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut ids = Vec::with_capacity(EACH);
                for i in 0..EACH {
                    ids.push(app.publish("signal.upvote.recorded", json!({"weight": p, "i": i})).await);
                }
                ids
            })
        })
        .collect();
    // The reader: every read must continue exactly where the last one ended.
    // A later appearance of a lower id would show up here as a gap.
    let store = app.store.clone();
    let reader = tokio::spawn(async move {
        let mut cursor = 0i64;
        let mut reads = 0u64;
        while cursor < (PUBLISHERS * EACH) as i64 {
            let rows = store.read_after(cursor, 500).await.unwrap();
            reads += 1;
            for row in rows {
                assert_eq!(row.id, cursor + 1, "after id {cursor} the reader saw {} : a gap or a reordering", row.id);
                cursor = row.id;
            }
            tokio::task::yield_now().await;
        }
        (cursor, reads)
    });
    let mut all = Vec::new();
    for p in publishers {
        let ids = p.await.unwrap();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "one publisher's ids ascend");
        all.extend(ids);
    }
    let (cursor, reads) = reader.await.unwrap();
    all.sort_unstable();
    assert_eq!(all, (1..=(PUBLISHERS * EACH) as i64).collect::<Vec<_>>(), "every acknowledged id exactly once");
    assert_eq!(cursor, (PUBLISHERS * EACH) as i64);
    assert!(reads > 1, "the reader ran while publishers did");
}
