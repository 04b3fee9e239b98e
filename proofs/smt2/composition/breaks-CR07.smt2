; placement-logic proof obligation: composition/breaks-CR07
; theorem: Composition
; breaking CR07 expert-reduction-groups is refuted
;   statement refuted: Expert parameters are reduced over the expert-data axes and non-expert ones over the whole data group, each with its own divisor.  [plan: expert gradients divided by the data axis only]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(declare-fun cr07_agree_x () Bool)
(declare-fun cr07_agree_y () Bool)
(declare-fun cr07_agree_microbatches () Bool)
(declare-fun cr07_t_x () Int)
(declare-fun cr07_T_x () Int)
(declare-fun cr07_t_y () Int)
(declare-fun cr07_T_y () Int)
(declare-fun cr07_t_microbatches () Int)
(declare-fun cr07_T_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x20 (= size_x 1)))
 (=> $x20 cr07_agree_x)))
(assert
 (let (($x25 (= size_y 1)))
 (=> $x25 cr07_agree_y)))
(assert
 (let (($x28 (= size_microbatches 1)))
 (=> $x28 cr07_agree_microbatches)))
(assert
 (>= cr07_t_x 1))
(assert
 (= cr07_T_x (* cr07_t_x (- size_x 1))))
(assert
 (>= cr07_t_y 1))
(assert
 (= cr07_T_y (* cr07_t_y (- size_y 1))))
(assert
 (>= cr07_t_microbatches 1))
(assert
 (= cr07_T_microbatches (* cr07_t_microbatches (- size_microbatches 1))))
(assert
 (let ((?x60 (to_real size_x)))
(let ((?x55 (* (+ (to_real cr07_t_x) (to_real cr07_T_x)) (+ (to_real cr07_t_y) (to_real cr07_T_y)))))
(let ((?x59 (* ?x55 (+ (to_real cr07_t_microbatches) (to_real cr07_T_microbatches)))))
(let (($x65 (and (distinct (* (* (* 1.0 (to_real 1)) (to_real 1)) ?x59) (* ?x59 ?x60)) true)))
(or false $x65))))))
(check-sat)
(exit)
