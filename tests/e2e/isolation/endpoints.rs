//! Isolation: endpoints (docs/security.md).
