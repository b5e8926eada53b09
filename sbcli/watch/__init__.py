"""Who watches a run: the events a run tells (:mod:`sbcli.watch.watcher`) and the experiment logs (:mod:`sbcli.watch.logs`)."""
