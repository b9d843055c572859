//! tessera-protocol
