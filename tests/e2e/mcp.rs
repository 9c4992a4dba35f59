//! The MCP gateway through the official MCP Python SDK.
