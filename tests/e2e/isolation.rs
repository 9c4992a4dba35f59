//! Isolation between the parties that share one gateway: clients, pods,
//! tenants, their plugins and their backends. Each module tests the
//! invariants of one part of the threat model in docs/security.md; each test
//! plays the attacker against the real binary and asserts what everyone
//! else still gets.

mod connections;
mod content;
mod endpoints;
mod memory;
mod state;
mod tenancy;
