"""The short-video simulator: the lab where the algorithms are proved, and the traffic of the demo.

``parameters`` (world size and calibrated response coefficients), ``world`` (users, items, authors),
``responses`` (how a user answers a page), ``stored_features`` (what the feature store holds of each
user: the states are built from it),
``behaviour`` (the logging policies), ``simulator`` (the day and page loop), ``events`` (a day as the
Kafka events of DESIGN 4) and ``ground_truth`` (a policy's true value). Three modules drive it from
outside: ``simulate`` writes simulated days to Kafka (``recsys-rl simulate``), ``sim_eval`` measures a
trained policy against the behaviour policy (``recsys-rl sim-eval``) and ``live_client`` plays the users
against a running gRPC server (the demo's second day and the end-to-end test).
"""
