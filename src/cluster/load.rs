//! Loading objects into a snapshot.
