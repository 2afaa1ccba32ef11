"""Control commands: unsigned intents, their signing and verification. Imports only schemas, never the services."""
