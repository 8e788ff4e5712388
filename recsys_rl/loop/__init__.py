"""The closed loop on one machine (``recsys-rl demo``): every room wired together, nothing but pip parts.

It is the only room that depends on all the others: the simulator writes a day to Kafka, the training
pipeline turns it into a blessed policy, the gRPC server serves it to simulated users, and the pipeline
runs again on the server's own decision log.
"""
