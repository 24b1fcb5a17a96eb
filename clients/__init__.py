"""luxun clients: producer, consumers and the Spark data source. They reach brokers only through ``idl``."""
