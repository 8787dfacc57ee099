"""``relayrl run``: one asynchronous RL run as local processes talking through the store.

* :mod:`.layout`: where everything of a run lives (``<run_dir>/config.json``, ``model/``,
  ``metrics.jsonl``, ``logs/``, ``status/``, and the bus when no ``[store] url`` is set);
* :mod:`.trainer_process`: the trainer loop (buffer -> step -> publish -> checkpoint -> metrics);
* :mod:`.rollout_process`: the rollout manager over the engines' HTTP endpoints;
* :mod:`.launcher`: starts and supervises the processes, shows progress, stops them cleanly;
* :mod:`.display`: the live terminal line.
"""
