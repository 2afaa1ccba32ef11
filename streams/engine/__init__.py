"""The plumbing that speaks to Faust and aiokafka; the processors (streams/joins, streams/detectors) never import it."""
