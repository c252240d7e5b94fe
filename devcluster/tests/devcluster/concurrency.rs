//! Concurrent writers and watchers.
