"""What a run loses while it trains, counted and bounded, in one room (the checks' room holds
what it checks before).

- `reward_failures`: a reward call that raised, reported from the reward workers to the driver;
- `sampling`: the sampler the trainer draws its batches from (verl's replay buffer, held, not
  patched), which counts each batch against what the step asked for;
- `lost_samples`: samples asked for and not received, explained by those reports, and past
  `algorithm.lost_samples.max_fraction` a stop;
- `chair_fallback`: samples trained on without a CHAIR score (the clip schedule's neutral bound),
  past `algorithm.chair_fallback.max_fraction` a stop naming the service and the node.
"""
