"""Framework configurations in and out: Hugging Face config.json, DeepSpeed (a Hugging Face
Trainer's too), Megatron-LM arguments and torchtitan job configs read as spec text
(``imports``, ``frameworks``, ``torchtitan``), and plans written back as those configurations.

Beside ``frontend`` (which reads the language itself): this package turns other formats into
the language and back, and prints nothing; ``commands.convert`` and ``commands.export`` parse
the command line and print what it returns, and the public API (``placement_logic.import_*``,
``export_plan``) calls it directly.
"""
