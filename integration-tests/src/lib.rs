//! Helpers shared by the integration tests: locating and running the real `tessera` binary.
