//! Isolation: tenancy (docs/security.md).
