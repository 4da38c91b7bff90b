"""The harness: what runs designs and the tuner on a job and measures them, above
``backend`` (it takes one): timing (one protocol for every timed collective call), check
(``mgg check``: every design against the scipy oracle) and tune (``mgg tune``: the tuner's
driver over designs built for each sample)."""
