"""Environments: JAX path (``brax:``/``probe:``, see ``base.py``) and host path (``gym:``, see
``gymnasium.py``). Use ``popjax.envs.registry`` to resolve names; gymnasium and brax are only
imported when an env of that kind is requested."""
