"""The environment Horovod's ranks start with: set_horovod_tuning()'s settings
(runtime/context.py), here without TensorFlow, so that the benchmark's
launcher can pass the same ones to its ranks."""

# Tensor fusion copies gradients into one buffer to send fewer, larger
# messages; this model has 7 dense gradients. Horovod's background thread
# sleeps a cycle between negotiations, and a gradient that becomes ready waits
# for the next one, so a short cycle starts each allreduce sooner.
# BENCHMARKS.md's lever table compares these settings with Horovod's own.
HOROVOD_TUNING = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0.2"}

# Open MPI's own allreduce of a large tensor over two ranks (Rabenseifner's)
# sends half of it each way, then the other half. Between two hosts over TCP
# many steps then take one half-tensor's transfer longer; recursive doubling
# sends the same bytes in one exchange, and on the namespace hosts of
# docs/how_many_hosts.md it ran every step at the link's rate. Only for one
# rank on each of two hosts: over loopback TCP on one host it was slower, and
# on more hosts it sends more bytes than Open MPI's choice.
# MPI reads its parameters from the environment at hvd.init().
TWO_HOSTS_ALLREDUCE = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}
# A choice of the user's: mpirun -mca, or the environment, or a rules file.
USERS_ALLREDUCE = (*TWO_HOSTS_ALLREDUCE, "OMPI_MCA_coll_tuned_dynamic_rules_filename")

# Open MPI's TCP transport sends the body of a large message as "puts" of up
# to 2 GiB once the receiver has acknowledged its first fragment. In an
# exchange both ranks send at once; a rank whose cores are busy with the
# backward pass may queue its whole body before it answers the other's first
# fragment, and that answer then waits behind the body: the two transfers run
# one after the other, and the step takes one tensor's transfer longer. In
# puts of 64 KiB the answer waits behind a few of them. On the namespace
# hosts of docs/how_many_hosts.md this ended the slow steps at 100 Mbit/s;
# over loopback TCP it costs the small step's collectives about a millisecond.
BETWEEN_HOSTS_TCP = {"OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": "65536"}
