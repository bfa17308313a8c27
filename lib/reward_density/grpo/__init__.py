"""The GRPO core: rollouts, the reward contract, advantages, the loss, policies, sampling, one step."""
