"""What the services run on: the bus and its authorization, TLS, the database, configuration,
leases, tracing, the clock."""
