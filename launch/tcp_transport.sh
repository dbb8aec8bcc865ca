# Sourced, not run: exports the MPI settings for ranks on hosts joined by TCP
# (Ethernet clusters), for launch/mpirun.sh --tcp and the SLURM templates
# (HYBRID_TCP=1). Usage: source launch/tcp_transport.sh [IFACE]
# MPI_FAMILY (launch/mpi_family.sh) picks the settings; Open MPI where unset.
#
# Both families move messages with UCX, over TCP: eager sends, so that a
# message leaves at once instead of waiting for the receiver to call into MPI;
# IFACE (e.g. eth0) keeps MPI on that interface. Open MPI also needs: Debian's
# build disables UCX in openmpi-mca-params.conf, and its other one-sided
# components cannot serve this job over TCP (osc rdma over btl tcp cannot
# create a window, osc pt2pt refuses MPI_THREAD_MULTIPLE); and the ring
# allreduce, so that every worker's link carries the same bytes. MPICH (ch4:ucx)
# takes UCX's settings as they are; its launcher's own connections take IFACE
# from HYDRA_IFACE. See docs/design.md section 12.
export UCX_TLS=tcp,self UCX_RNDV_THRESH=inf
if [ "${MPI_FAMILY:-openmpi}" = openmpi ]; then
    export OMPI_MCA_btl=tcp,self OMPI_MCA_pml=ucx OMPI_MCA_osc=ucx
    export OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any OMPI_MCA_osc_ucx_tls=any OMPI_MCA_osc_ucx_devices=any
    export OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4
fi
if [ -n "${1:-}" ]; then
    export UCX_NET_DEVICES=$1
    if [ "${MPI_FAMILY:-openmpi}" = openmpi ]; then
        export OMPI_MCA_btl_tcp_if_include=$1 OMPI_MCA_oob_tcp_if_include=$1
    else
        export HYDRA_IFACE=$1
    fi
fi
