"""relayrl-environments: the built-in task domains, each with its tasks, tools, grader and demonstrations.

* :mod:`relayrl.environments.countdown`: ``countdown``, arithmetic answers graded in a sandbox;
* :mod:`relayrl.environments.code` and :mod:`relayrl.environments.bugfix`: ``code``, bug-fix tasks
  (the shipped ones in ``tasks/bugfix``) with agent tools and hidden tests in sandboxes, and the
  gold-patch expert;
* :mod:`relayrl.environments.code_search`: ``code-search``, generated repositories searched with
  tools, F1 graded in a sandbox;
* :mod:`relayrl.environments.kernels`: ``kernels``, faster NumPy/PyTorch kernels, correctness and
  timing graded in sandboxes;
* :mod:`relayrl.environments.testing`: the cheating and timing-exploit suites graders must pass.

Each registers through relayrl-rollout's ``relayrl_rollout_environments`` hook and builds on
:mod:`relayrl.rollout.environment` (the contract and its helpers) and relayrl-sandbox (isolation and
grading). relayrl-rollout runs environments and imports none of these.
"""
