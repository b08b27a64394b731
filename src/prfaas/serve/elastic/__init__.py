"""serve.elastic: the live side of the elastic pool. ``Provider`` is the small interface a pool's
nodes are added, drained and listed through (a local one over the supervisor, or Kubernetes);
``ElasticController`` carries ``policy.Autoscaler``'s decisions out through one, choosing groups
and nodes by ``policy.pool_actions`` (the simulator's rules). docs/elastic.md."""
