//! Isolation: memory (docs/security.md).
