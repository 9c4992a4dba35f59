//! Isolation: connections (docs/security.md).
