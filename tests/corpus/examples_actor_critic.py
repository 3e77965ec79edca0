"""pytorch/examples reinforcement_learning/actor_critic.py: Policy (one hidden layer, an actor's softmax head and a
critic's value head, one unbatched state at a time; the episode's saved actions and rewards kept in lists on the
module itself), Adam at lr 3e-2; select_action (Categorical(probs).sample(), the log-probability and the value
appended to model.saved_actions) at every step of an episode, then finish_episode (discounted returns, normalized;
policy losses and smooth-L1 value losses summed; one backward and one step per episode; the lists emptied).

gym's CartPole-v0 is not installed: CartPole below is its dynamics (gym's cartpole.py: the same constants, Euler
steps, the same end of an episode), reset from a seed drawn by the loader, an episode cut at 24 steps (upstream
9999). One batch of the loader is one episode: its seed (the seeds a list: a tensor as the dataset breaks
check_equivalence, tests/corpus/test_corpus_attack2.py). The run's calls: run.model in select_action,
run.autocast() around it, run.backward(loss), run.step()."""
from collections import namedtuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical
from torch.utils.data import DataLoader

from accel.testing import Loop, Setup

REFUSES = {}
GAMMA, MAX_STEPS = 0.99, 24
SavedAction = namedtuple('SavedAction', ['log_prob', 'value'])
eps = np.finfo(np.float32).eps.item()


class CartPole:
    """gym's CartPoleEnv (v0): the pole's and the cart's equations of motion, one Euler step of 0.02 s per action."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass, polemass_length = masspole + masscart, masspole * length
    theta_threshold_radians, x_threshold = 12 * 2 * np.pi / 360, 2.4

    def reset(self, seed):
        self.state = np.random.default_rng(seed).uniform(low=-0.05, high=0.05, size=(4,))
        return np.array(self.state, dtype=np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * theta_dot ** 2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta ** 2 / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state = (x, x_dot, theta, theta_dot)
        done = bool(x < -self.x_threshold or x > self.x_threshold or theta < -self.theta_threshold_radians
                    or theta > self.theta_threshold_radians)
        return np.array(self.state, dtype=np.float32), 1.0, done, {}


class Policy(nn.Module):
    """implements both actor and critic in one model"""

    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)
        self.saved_actions = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.affine1(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


class Train(Loop):
    """main(): an episode of select_action and env.step, then finish_episode()."""

    name = "actor_critic"

    def start(self, held, run):
        self.env, self.running_reward, self.episode_rewards = CartPole(), 10, []

    def select_action(self, run, model, state):
        state = torch.from_numpy(state).float()
        with run.autocast():
            probs, state_value = run.model(state)
        m = Categorical(probs.float())
        action = m.sample()
        model.saved_actions.append(SavedAction(m.log_prob(action), state_value.float()))
        return action.item()

    def finish_episode(self, run, model):
        R = 0
        saved_actions = model.saved_actions
        policy_losses, value_losses, returns = [], [], []
        for r in model.rewards[::-1]:
            R = r + GAMMA * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        for (log_prob, value), R in zip(saved_actions, returns):
            advantage = R - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        run.backward(loss)
        run.step()
        del model.rewards[:]
        del model.saved_actions[:]
        return loss

    def step(self, index, run, held, batch, loss_of):
        model = held.model
        state, ep_reward = self.env.reset(int(batch)), 0
        for t in range(1, MAX_STEPS + 1):
            action = self.select_action(run, model, state)
            state, reward, done, _ = self.env.step(action)
            model.rewards.append(reward)
            ep_reward += reward
            if done:
                break
        self.running_reward = 0.05 * ep_reward + (1 - 0.05) * self.running_reward
        self.episode_rewards.append(ep_reward)
        return self.finish_episode(run, model).detach()

    def observed(self):
        return {"episode rewards": torch.tensor(self.episode_rewards)}


def build() -> Setup:
    torch.manual_seed(543)
    model = Policy()
    optimizer = optim.Adam(model.parameters(), lr=3e-2)
    loader = DataLoader(list(range(543, 551)), batch_size=None, shuffle=True,
                        generator=torch.Generator().manual_seed(543))
    return Setup(model, optimizer, loader, loop=Train())
