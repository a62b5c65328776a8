"""gRPC edges of the peer: channels, servicers and the message conversion to and from protocol cores."""
