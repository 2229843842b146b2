"""vprl's executor and rewards inside RL engines that are not vprl's: a plain trl script
(`train.integrations.for_trl`) and verl (`train.integrations.for_verl`, data through
`python -m train.integrations.verl_data`). Both share one scoring session (`session.py`)."""
