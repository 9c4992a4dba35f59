//! Translations between OpenAI's Chat Completions API, which clients speak to
//! the gateway, and other providers' own APIs, which its backends may speak.
//!
//! Pure functions over request and response bytes: no I/O, no HTTP types. The
//! gateway sends what [`anthropic::chat_request`] made, with the provider's
//! headers, and turns what comes back into OpenAI's shapes with the rest.

pub mod anthropic;
