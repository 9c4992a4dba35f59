//! Isolation: content (docs/security.md).
