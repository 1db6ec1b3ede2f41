"""The driver: what runs in the one controller process that steers a run (not to be confused with
`hybridrl.training`, the FSDP engine the workers run). Here live the PPO/GRPO fit loop (`ppo_trainer`: generate,
score, advantages, update calls, validation, in verl's phase order), its wiring (`launch`: Ray, worker groups,
datasets, rewards, run plan), the `main_ppo` entry point, the SFT trainer, checkpoint directories and retention
(`checkpoint_manager`, integrity, resume checks, the run-directory lock), metrics and loggers. Nothing here
touches model weights; it sends batches to the workers and reads back their results."""
