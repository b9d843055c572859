//! tessera-engine
