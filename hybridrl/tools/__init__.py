"""Built-in tools (calculator, sandboxed Python) and the sandbox they and the code-reward scorer run in."""
