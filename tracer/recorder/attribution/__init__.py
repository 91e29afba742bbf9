"""Where an op came from: its Python stack (``stacks``, with ``fxframes`` and ``qualnames``), its
module (``modules``, with the root modules' ``parameters``), its input shapes (``shapes``) and the
annotation ranges around it (``annotations``)."""
