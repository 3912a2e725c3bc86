//! A replica as `serve` wires it, over objects given as YAML text: the webhook's state
//! with a committer of the test's choosing, caches already synced, no Events, no routing.

use std::sync::{Arc, Mutex};

use card_quota::decide::Config;
use card_quota::live::caches::Synced;
use card_quota::live::Committer;
use card_quota::snapshot::load::load;
use card_quota::webhook::server::{Live, State};

/// A replica over the objects of `text` that records through `committer`.
pub fn live_state(text: &str, committer: Committer) -> Arc<State> {
    let (snap, skipped) = load(text).expect("the test's objects load");
    assert!(skipped.is_empty(), "{skipped:?}");
    Arc::new(State::live(
        Arc::new(Mutex::new(snap)),
        Config::default(),
        Live {
            committer: Arc::new(committer),
            synced: Arc::new(Synced::already()),
            events: None,
            routing: None,
        },
    ))
}
