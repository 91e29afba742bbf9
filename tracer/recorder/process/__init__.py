"""The recording process: who it is (``process_info``: rank, world, the start metadata), its
process group's arrival and end (``process_group``), its clock against rank 0's (``clock``) and
how it leaves (``exits``)."""
