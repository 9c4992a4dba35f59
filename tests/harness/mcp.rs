//! MCP servers written with the official MCP Python SDK, and its client, for the MCP gateway tests.
