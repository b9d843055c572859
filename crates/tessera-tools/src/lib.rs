//! tessera-tools
