//! tessera-llm
