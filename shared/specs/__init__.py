"""What a submission must be: a job spec and its train section checked against LLaMA-Factory, its
paths confined to the team's roots, its size bounded, its quota."""
