"""Clients of each service's gRPC contract, shared by the services that call it and by other tools."""
