//! The hash maps the in-memory model keeps objects in. Keys are short names (pods,
//! queues, nodes) looked up several times per decision and watch event; foldhash,
//! seeded per map, hashes them several times faster than std's SipHash and still
//! resists keys chosen to collide.

/// A hash map keyed by object names.
pub type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set of object names.
pub type Set<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
