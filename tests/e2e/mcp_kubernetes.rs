//! MCPRoute on the real apiserver.
