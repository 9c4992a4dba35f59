//! Isolation between the parties that share one gateway: clients, pods,
//! tenants, their plugins and their backends. Each module tests the
//! invariants of one part of the threat model in docs/security.md; each test
//! plays the attacker against the real binary and asserts what everyone
//! else still gets.

#[path = "isolation/connections.rs"]
mod connections;
#[path = "isolation/content.rs"]
mod content;
#[path = "isolation/endpoints.rs"]
mod endpoints;
#[path = "isolation/memory.rs"]
mod memory;
#[path = "isolation/tenancy.rs"]
mod tenancy;
