"""What the recorder knows of the frameworks it records: DTensor (``dtensor``), torch.compile
(``compiled``), higher-order operators (``hops``), torch.distributed.pipelining (``pipelining``)
and FSDP2's communication (``fsdp_credit``)."""
