"""The role loops both runners build: parameter, learner group, actor, and what an actor or learner uses
(sampler, env backends, evaluation, AAPS, elastic rule, CUDA graph). No MPI call here: roles use the transport."""
