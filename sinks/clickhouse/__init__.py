"""The ClickHouse sink: Kafka topics -> ClickHouse tables, effectively exactly once."""
