"""A pipeline on any model (--pp N --split MODULE[,...]): the stages a split makes, their
programs and P2P messages, each pipeline rank's memory, and what torch.distributed.pipelining
keeps itself.
"""
