from gpuhpc.slurm.parsers import parse_job_gpu_indexes

DETAIL = ("JobId=1 JobName=wrap UserId=root(0) JobState=RUNNING NodeList=gpu-node[1-2],mig-node1 "
          "Nodes=gpu-node[1-2] CPU_IDs=0-1 Mem=1000 GRES=gpu:h100:2(IDX:4-5) "
          "Nodes=mig-node1 CPU_IDs=0 Mem=1000 GRES=gpu:1g.10gb:1(IDX:0),gpu:3g.40gb:1(IDX:7) "
          "MinCPUsNode=1 TresPerNode=gres:gpu:2")


def test_gres_indexes_per_node():
    assert parse_job_gpu_indexes(DETAIL) == {"gpu-node1": [4, 5], "gpu-node2": [4, 5], "mig-node1": [0, 7]}
    assert parse_job_gpu_indexes("JobId=2 Nodes=cpu-node1 CPU_IDs=0 Mem=10 GRES=") == {"cpu-node1": []}
