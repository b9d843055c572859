//! tessera-manifest
