"""vprl's executor and rewards inside RL engines that are not vprl's: a plain trl script
(`vprl.train.integrations.for_trl`) and verl (`vprl.train.integrations.for_verl`, data through
`python -m vprl.train.integrations.verl_data`). Both share one scoring session (`session.py`)."""
