"""Learned repair: episodes of up to `max_turns` programs, each written after the feedback on the
one before (docs/repair.md). The conversation's text is `vprl.train.prompts.conversation`; the
feedback message is `vprl.rewards.feedback`.

- `episode`: the typed record of an episode (`Turn`, `Episode`) and its per-batch statistics;
- `turns`: the episode loop over a batch, generic in how the next program is generated;
- `trl_rollout`: that loop as trl's `rollout_func`, with the feedback tokens masked out of the loss;
- `log`: the run folder's `episodes.jsonl`.
"""
