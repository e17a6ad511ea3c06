"""The train program jaxmem compiles: ``train`` (the step with abstract inputs), ``sharding``
(meshes and logical-axis rules), ``remat`` (checkpoint policies) and ``optimizers`` (optax)."""
