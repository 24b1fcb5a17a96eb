"""The Thrift IDL of Luxun's QueueService (``luxun.thrift``, ``message.thrift``)."""
